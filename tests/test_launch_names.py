"""Names with control characters are refused where models and GPUs are read (issue 39, item 6): ESC, NUL, a newline,
a tab, DEL, a bidi override or a line separator in a custom model's name, a config.json's ``_name_or_path`` or a
GPU's name would reach terminals raw and end a launch command's comment line."""
import json
from dataclasses import replace

import pytest

from batching.cli.main import main
from batching.sim.hardware.specs import GPUS, MODELS, Deployment, Node, gpu_from_dict, gpu_to_dict, model_from_dict
from batching.sim.simulate import Scenario

LLAMA = {"num_layers": 32, "hidden_size": 4096, "num_heads": 32, "num_kv_heads": 8, "head_dim": 128,
         "ffn_size": 14336, "vocab_size": 128256}
HF = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
      "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
      "max_position_embeddings": 8192}


@pytest.mark.parametrize("bad", ["H100\ntouch PWNED", "H\x1b[31mRED", "nul\x00x", "tab\tx", "del\x7f",
                                 "bidi\u202eevil", "line\u2028sep"])
def test_names_with_control_characters_are_refused(bad):
    with pytest.raises(ValueError, match=r"name=.* control character \(U\+[0-9A-F]{4} at position \d+\)"):
        gpu_from_dict(dict(gpu_to_dict(GPUS["h100-sxm"]), name=bad))
    with pytest.raises(ValueError, match="control character"):
        model_from_dict(dict(LLAMA, name=bad))
    with pytest.raises(ValueError, match=r"^_name_or_path=.*control character"):
        model_from_dict(dict(HF, _name_or_path="org/" + bad))
    with pytest.raises(ValueError, match="control character"):  # a GPU built in code is refused by the scenario
        Scenario(Deployment(Node(replace(GPUS["h100-sxm"], name=bad), 8, 8), MODELS["llama-3.1-8b"])).validate()


def test_specs_never_prints_escape_or_nul(tmp_path, capsys):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(dict(LLAMA, name="evil\x1b[31mRED\x00x")))
    rc = main(["specs", "--model-json", str(path)])
    out = capsys.readouterr()
    assert rc != 0 and "control character" in out.err
    assert not any(c in out.out + out.err for c in "\x1b\x00")


def test_printable_names_are_kept():
    for name in ("Llama 3.1 (café) 日本語", "x;touch PWNED #", "$(touch PWNED)"):
        assert model_from_dict(dict(LLAMA, name=name)).name == name
    assert model_from_dict(dict(HF, _name_or_path=" org/model\n")).name == "org/model"  # surrounding blanks go
