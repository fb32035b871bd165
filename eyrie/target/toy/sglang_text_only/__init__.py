"""SGLang-side code for serving toy-kimi-k25 text-only (imported by SGLang, never by Eyrie).

SGLang builds the multimodal processor of a multimodal architecture when it starts, whether or
not a request ever carries an image. Kimi-K2.5's own (KimiK2_5VLImageProcessor) reads
`media_processor.media_proc_cfg` from the checkpoint's remote-code processor, which the toy does
not ship (its folder holds a plain tokenizer, and nothing in it is executed). SGLang's own
extension point replaces that processor: with `SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE` naming this
package, `import_processors(..., overwrite=True)` maps KimiK25ForConditionalGeneration to the
class in `kimi_k25.py` here. Nothing of SGLang is patched, and the model code is SGLang's own.
"""

ENV = "SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE"
PACKAGE = "eyrie.target.toy.sglang_text_only"
