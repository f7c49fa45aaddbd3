"""Config loading: precedence, normalisation, validation and error messages."""
from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from streamd.config import (
    SETTINGS,
    AdminConfig,
    Config,
    EndpointingConfig,
    EngineConfig,
    LogConfig,
    ServerConfig,
    add_arguments,
    default_admin_socket,
    load_config,
    normalize_device,
    normalize_dtype,
)
from streamd.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
NO_FILE = Path("/nonexistent/streamd.toml")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def load(*argv: str, env: dict[str, str] | None = None, default_path: Path = NO_FILE) -> Config:
    return load_config(parse(*argv), env or {}, default_path=default_path)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "streamd.toml"
    path.write_text(text)
    return path


def test_defaults_without_any_source() -> None:
    cfg = load()
    assert cfg.server == ServerConfig()
    assert (cfg.server.host, cfg.server.port, cfg.server.max_streams) == ("127.0.0.1", 8765, 64)
    assert cfg.server.max_message_bytes == 1 << 20
    assert (cfg.server.idle_timeout_s, cfg.server.max_session_s, cfg.server.drain_timeout_s) == (
        30.0, 14400.0, 30.0)
    assert cfg.engine == EngineConfig(model=None, device="auto", dtype="fp32", right_context=None,
                                      batch_wait_ms=10)
    assert cfg.endpointing == EndpointingConfig(800, 5000, 30_000)
    assert cfg.admin == AdminConfig(socket=Path("/run/streamd/admin.sock"), port=None)
    assert cfg.log == LogConfig("info", "text")
    assert cfg.config_file is None


def test_precedence_flag_over_env_over_file_over_default(tmp_path: Path) -> None:
    path = write(tmp_path, "[server]\nport = 1001\nhost = '0.0.0.0'\n")
    env = {"STREAMD_CONFIG": str(path), "STREAMD_PORT": "1002"}
    assert load("--port", "1003", env=env).server.port == 1003
    assert load(env=env).server.port == 1002
    from_file = load(env={"STREAMD_CONFIG": str(path)})
    assert from_file.server.port == 1001
    assert from_file.server.host == "0.0.0.0"
    assert from_file.config_file == path
    assert load().server.port == 8765


def test_config_flag_beats_env_and_default_path(tmp_path: Path) -> None:
    a = write(tmp_path, "[server]\nport = 1\n")
    b = tmp_path / "b.toml"
    b.write_text("[server]\nport = 2\n")
    assert load("--config", str(a), env={"STREAMD_CONFIG": str(b)}).server.port == 1
    assert load(default_path=b).server.port == 2
    assert load(env={"STREAMD_CONFIG": ""}, default_path=b).server.port == 8765


def test_missing_explicit_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load("--config", str(tmp_path / "nope.toml"))


@pytest.mark.parametrize(("given", "expected"), [
    ("fp32", "fp32"), ("float32", "fp32"), ("FP32", "fp32"), ("bf16", "bf16"),
    ("bfloat16", "bf16"), ("torch.bfloat16", "bf16"), ("fp16", "fp16"), ("float16", "fp16"),
    ("half", "fp16"),
])
def test_dtype_is_normalised(given: str, expected: str) -> None:
    assert normalize_dtype(given) == expected
    assert load("--dtype", given).engine.dtype == expected


def test_torch_dtype_name() -> None:
    assert [EngineConfig(dtype=d).torch_dtype for d in ("fp32", "bf16", "fp16")] == [
        "float32", "bfloat16", "float16"]


def test_bad_dtype_names_its_source() -> None:
    with pytest.raises(ConfigError, match=r"engine\.dtype: unknown dtype 'int8'.*\(from --dtype\)"):
        load("--dtype", "int8")
    with pytest.raises(ConfigError, match=r"from STREAMD_DTYPE"):
        load(env={"STREAMD_DTYPE": "fp8"})


def test_device_normalisation_and_resolution() -> None:
    assert normalize_device("CUDA") == "cuda:0"
    assert normalize_device("cuda:3") == "cuda:3"
    with pytest.raises(ValueError, match="unknown device"):
        normalize_device("gpu")
    auto = EngineConfig()
    assert auto.resolved_device(cuda_available=True) == "cuda:0"
    assert auto.resolved_device(cuda_available=False) == "cpu"
    assert EngineConfig(device="cuda:1").resolved_device(cuda_available=False) == "cuda:1"
    with pytest.raises(ConfigError, match="engine.device"):
        load("--device", "tpu")


def test_admin_socket_default_follows_runtime_directory() -> None:
    assert default_admin_socket({"RUNTIME_DIRECTORY": "/run/streamd/gpu0"}) == Path(
        "/run/streamd/gpu0/admin.sock")
    assert default_admin_socket({"RUNTIME_DIRECTORY": "/run/a:/run/b"}) == Path("/run/a/admin.sock")
    assert default_admin_socket({"XDG_RUNTIME_DIR": "/run/user/1000"}) == Path(
        "/run/user/1000/streamd/admin.sock")
    assert default_admin_socket({}) == Path("/run/streamd/admin.sock")
    assert load(env={"RUNTIME_DIRECTORY": "/run/x"}).admin.socket == Path("/run/x/admin.sock")
    assert load("--admin-socket", "").admin.socket is None


def test_optional_values_can_be_cleared_with_empty_string() -> None:
    assert load("--right-context", "6").engine.right_context == 6
    assert load("--right-context", "", env={"STREAMD_RIGHT_CONTEXT": "6"}).engine.right_context is None


@pytest.mark.parametrize(("argv", "env", "pattern"), [
    (("--port", "70000"), {}, r"server\.port must be in 0\.\.65535, got 70000 \(from --port\)"),
    ((), {"STREAMD_PORT": "http"}, r"STREAMD_PORT: expected an integer, got 'http'"),
    (("--port", "80.5"), {}, r"--port: expected an integer"),
    (("--max-streams", "0"), {}, r"server\.max_streams must be at least 1"),
    (("--idle-timeout-s", "nan"), {}, r"--idle-timeout-s: expected a finite number"),
    (("--idle-timeout-s", "0"), {}, r"server\.idle_timeout_s must be positive"),
    (("--drain-timeout-s", "-1"), {}, r"server\.drain_timeout_s must not be negative"),
    (("--max-message-bytes", "10"), {}, r"max_message_bytes must be at least 1024"),
    (("--batch-wait-ms", "5000"), {}, r"engine\.batch_wait_ms must be in 0\.\.1000"),
    (("--right-context", "-1"), {}, r"engine\.right_context must not be negative"),
    (("--cuda-graphs", "maybe"), {}, r"engine\.cuda_graphs must be on or off"),
    (("--thread-cpu", "-1"), {}, r"engine\.thread_cpu must not be negative"),
    (("--silence-after-speech-ms", "-5"), {}, r"endpointing\.silence_after_speech_ms must be in"),
    (("--log-level", "loud"), {}, r"log\.level must be one of"),
    (("--log-format", "xml"), {}, r"log\.format must be text or json"),
    (("--admin-port", "9000"), {}, r"admin\.token_file is required when admin\.port is set"),
])
def test_invalid_values_are_reported_clearly(argv: tuple[str, ...], env: dict[str, str],
                                             pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        load(*argv, env=env)


def test_toml_types_are_checked(tmp_path: Path) -> None:
    path = write(tmp_path, "[server]\nport = true\n")
    with pytest.raises(ConfigError, match=r"\[server\] port: expected an integer, got True"):
        load("--config", str(path))
    path.write_text("[engine]\ndevice = 0\n")
    with pytest.raises(ConfigError, match=r"\[engine\] device: expected a string"):
        load("--config", str(path))


def test_toml_numbers_and_case(tmp_path: Path) -> None:
    path = write(tmp_path, "[server]\nidle_timeout_s = 5\n[log]\nlevel = 'DEBUG'\n")
    cfg = load("--config", str(path))
    assert cfg.server.idle_timeout_s == 5.0
    assert cfg.log.level == "debug"


def test_unknown_toml_keys_are_rejected_with_a_suggestion(tmp_path: Path) -> None:
    path = write(tmp_path, "[server]\nprot = 1\n")
    with pytest.raises(ConfigError, match=r"unknown setting \[server\] prot \(did you mean 'port'\?\)"):
        load("--config", str(path))
    path.write_text("[servre]\nport = 1\n")
    with pytest.raises(ConfigError, match=r"unknown section \[servre\] \(did you mean 'server'\?\)"):
        load("--config", str(path))
    path.write_text("server = 1\n")
    with pytest.raises(ConfigError, match=r"\[server\] must be a table"):
        load("--config", str(path))


def test_invalid_toml_is_reported(tmp_path: Path) -> None:
    path = write(tmp_path, "[server\nport = 1\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load("--config", str(path))


def test_relative_paths_in_the_file_are_relative_to_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    (tmp_path / "model.nemo").write_bytes(b"")
    path = write(tmp_path, "[engine]\nmodel = 'model.nemo'\n")
    monkeypatch.chdir("/")
    assert load("--config", str(path)).engine.model == tmp_path / "model.nemo"


def test_missing_files_are_reported_with_origin(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"engine\.model: no such file .*missing\.nemo \(from --model\)"):
        load("--model", str(tmp_path / "missing.nemo"))
    with pytest.raises(ConfigError, match=r"server\.tls_cert: no such file"):
        load(env={"STREAMD_TLS_CERT": str(tmp_path / "cert.pem")})


def test_tls_key_needs_cert(tmp_path: Path) -> None:
    key = tmp_path / "key.pem"
    key.write_text("")
    with pytest.raises(ConfigError, match=r"server\.tls_key needs server\.tls_cert"):
        load("--tls-key", str(key))
    cert = tmp_path / "cert.pem"
    cert.write_text("")
    cfg = load("--tls-key", str(key), "--tls-cert", str(cert))
    assert (cfg.server.tls_cert, cfg.server.tls_key) == (cert, key)


def test_admin_tcp_with_token_file(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("secret\n")
    cfg = load("--admin-port", "9100", "--admin-token-file", str(token))
    assert (cfg.admin.host, cfg.admin.port, cfg.admin.token_file) == ("127.0.0.1", 9100, token)


def test_every_setting_has_a_flag_and_env_var() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    help_text = parser.format_help()
    for s in SETTINGS:
        assert s.flag in help_text
        assert s.env in help_text
    assert len({s.name for s in SETTINGS}) == len(SETTINGS)
    assert parser.parse_args([]) == argparse.Namespace()


def test_endpointing_enabled() -> None:
    assert EndpointingConfig().enabled
    assert EndpointingConfig(0, 0, 1).enabled
    assert not EndpointingConfig(0, 0, 0).enabled


def test_configs_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().server.port = 1  # type: ignore[misc]


def test_example_config_matches_the_defaults() -> None:
    example = REPO / "systemd" / "streamd.toml"
    cfg = load("--config", str(example))
    assert dataclasses.replace(cfg, config_file=None) == load()


def test_does_not_import_torch_or_websockets() -> None:
    code = ("import sys, streamd.config; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'websockets')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_parse_device_takes_the_configurations_names_and_checks_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamd.engine.placement import parse_device

    assert parse_device(" CPU ") == torch.device("cpu")
    for bad in ("gpu", "cpu:1", "mps", "cuda:x"):
        with pytest.raises(ValueError, match=f"unknown device '{bad}'; use auto, cpu or cuda:N"):
            parse_device(bad)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert parse_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="CUDA is not available on this machine"):
        parse_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert parse_device("auto") == torch.device("cuda", 0) and parse_device("CUDA:1") == torch.device("cuda", 1)
    with pytest.raises(ValueError, match=r"only 2 CUDA device\(s\)"):
        parse_device("cuda:2")
