"""Each built archive's recorded sha256: written next to it, checked before anything registers or serves it."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest

from scripts.archive.core import load_core
from scripts.archive.reader import DigestMismatch, MarFile
from scripts.deploy.render import write_kserve
from scripts.layout import MODEL_STORE, ROOT
from scripts.server.config import ServerConfig
from scripts.server.process import free_ports
from scripts.server.serve import verify_loaded_archives

BUILT = MODEL_STORE / "digits.mar"


@pytest.fixture
def archive(tmp_path) -> MarFile:
    """A copy of the built digits.mar with its recorded digest, in a model store of its own."""
    if not MarFile(BUILT).digest_file.exists():
        pytest.skip("model_store/digits.mar(.sha256) is not built (make archive)")
    store = tmp_path / "model_store"
    store.mkdir()
    return MarFile(BUILT).copy(store / "digits.mar")


def test_make_archive_records_the_sha256_in_sha256sums_format():
    if not MarFile(BUILT).digest_file.exists():
        pytest.skip("model_store/digits.mar(.sha256) is not built (make archive)")
    actual = hashlib.sha256(BUILT.read_bytes()).hexdigest()
    assert MarFile(BUILT).digest_file.read_text() == f"{actual}  digits.mar\n"
    assert MarFile(BUILT).verify_digest() == actual


def test_a_copy_keeps_its_record_under_its_new_name(archive, tmp_path):
    renamed = archive.copy(tmp_path / "model_store" / "digits-copy.mar")
    assert renamed.digest_file.read_text().endswith("  digits-copy.mar\n")
    assert renamed.verify_digest() == archive.verify_digest()


def test_one_changed_byte_is_refused_naming_the_archive_and_both_digests(archive):
    expected = archive.recorded_digest()
    data = bytearray(archive.path.read_bytes())
    data[len(data) // 2] ^= 0x01
    archive.path.write_bytes(bytes(data))
    actual = hashlib.sha256(bytes(data)).hexdigest()
    with pytest.raises(DigestMismatch) as refused:
        archive.verify_digest()
    message = str(refused.value)
    assert message.startswith("digits.mar does not match its recorded sha256")
    assert f"expected {expected}" in message and f"actual {actual}" in message and expected != actual


def test_an_archive_without_a_record_is_refused(archive):
    archive.digest_file.unlink()
    missing = r"digits.mar has no recorded sha256 \(digits.mar.sha256 is missing; actual sha256 [0-9a-f]{64}\)"
    with pytest.raises(DigestMismatch, match=missing):
        archive.verify_digest()


def test_make_serve_checks_every_archive_it_loads(archive, tmp_path):
    """serve.py refuses to start when one archive of load_models is unrecorded or changed."""
    store = archive.path.parent
    lanes = {"load_models": "digits=digits.mar,digits-bulk=digits.mar,minilm=minilm.mar"}
    config = ServerConfig.read(ServerConfig.read().render(tmp_path / "config.properties", store, free_ports(), lanes))
    archive.copy(store / "minilm.mar")  # stands in for the minilm archive: only its digest matters here
    assert verify_loaded_archives(config, store) == ["digits.mar", "minilm.mar"]
    (store / "minilm.mar.sha256").write_text("0" * 64 + "  minilm.mar\n")
    with pytest.raises(DigestMismatch, match=f"minilm.mar does not match its recorded sha256: expected {'0' * 64}"):
        verify_loaded_archives(config, store)


def tamper(archive: MarFile) -> None:
    with archive.path.open("ab") as file:
        file.write(b"\0")


def test_the_containers_start_stops_on_a_changed_archive_naming_it(archive, tmp_path):
    """scripts/container/entrypoint.py checks every archive the config loads before TorchServe starts."""
    config = ServerConfig.read().render(tmp_path / "config.properties", archive.path.parent, free_ports(), only_digits())
    tamper(archive)
    done = subprocess.run(
        [sys.executable, "-m", "scripts.container.entrypoint", "--ts-config", str(config), "--key-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "digits.mar does not match its recorded sha256" in done.stderr
    assert not (tmp_path / "key_file.json").exists()  # TorchServe never started


def digits_config(archive: MarFile, tmp_path) -> ServerConfig:
    rendered = ServerConfig.read().render(tmp_path / "digits.properties", archive.path.parent, free_ports(), only_digits())
    return ServerConfig.read(rendered)


def only_digits() -> dict[str, str]:
    return {"load_models": "digits=digits.mar,digits-bulk=digits.mar"}


def test_every_path_that_loads_an_archive_in_process_checks_its_digest(archive, tmp_path):
    # In-process and Ray batch jobs (scripts/jobs) load through load_core; the KServe bucket through write_kserve.
    tamper(archive)
    with pytest.raises(DigestMismatch, match="digits.mar does not match its recorded sha256"):
        load_core(archive.path)
    source = digits_config(archive, tmp_path)
    with pytest.raises(DigestMismatch, match="digits.mar does not match its recorded sha256"):
        write_kserve(source, tmp_path / "bucket")


def test_the_kserve_bucket_carries_each_archive_with_its_recorded_digest(archive, tmp_path):
    source = digits_config(archive, tmp_path)
    written = write_kserve(source, tmp_path / "bucket")
    copied = MarFile(tmp_path / "bucket" / "model-store" / "digits.mar")
    assert copied.path in written and copied.digest_file in written
    assert copied.verify_digest() == archive.verify_digest()
