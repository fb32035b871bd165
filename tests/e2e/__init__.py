"""End-to-end harness of the SGLang backend: GPU runs and their CPU rehearsal (--standin).

Run with tests/ on PYTHONPATH, as scripts/gpu_e2e_sglang.sh and scripts/gpu_e2e_kimi.sh do
(`python3 -m e2e.sglang_e2e`); the GPU tests import it the same way.
"""
