"""Build the tiny random-weight Qwen2 model the real-engine tests serve (docs/testing.md).

Run with the real-engine venv's Python (it needs torch, transformers and tokenizers):
``python make_model.py OUT_DIR``. The same Python and library versions give byte-identical
files every run: the tokenizer is trained on a fixed, sorted list of the standard library's
own sources and the weights come from a fixed seed. Greedy output is gibberish, but
deterministic, which is all a comparison with the worker's own routes needs.
"""

from __future__ import annotations

import json
import pathlib
import sys
import sysconfig

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

SEED = 20261203
VOCAB_SIZE = 2048
# Text the tokenizer learns from: standard library modules present in every Python >= 3.10.
CORPUS = sorted(
    [
        "argparse.py",
        "difflib.py",
        "json/decoder.py",
        "json/encoder.py",
        "string.py",
        "textwrap.py",
    ]
)
# Marked special: the chat template's frame, stripped from answers like Qwen's.
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added but not special, as in Qwen: the answer keeps them, so the hermes tool parser and a
# reasoning parser can see them.
MARKERS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]

# Qwen 2.5's template shape: the tools in the system turn, hermes-style <tool_call> blocks.
CHAT_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}\
{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}
{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\
\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and \
arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, \
"arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- else %}
{%- if messages[0]['role'] == 'system' %}\
{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- for message in messages %}
{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) \
or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>' + message.role }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\\n<tool_call>\\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}
{%- if tool_call.arguments is string %}{{- tool_call.arguments }}\
{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}\
{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}
{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}\
{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


def _corpus() -> list[str]:
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    return [(stdlib / name).read_text(encoding="utf-8") for name in CORPUS]


def build_tokenizer(out: pathlib.Path) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE tokenizer and save it with the chat template."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    tokenizer.add_tokens(
        [AddedToken(marker, special=False, normalized=False) for marker in MARKERS]
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=1024,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )
    wrapped.save_pretrained(out)
    # The template in tokenizer_config.json, where every transformers version looks (5.x alone
    # writes it to chat_template.jinja).
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (out / "chat_template.jinja").unlink(missing_ok=True)
    return wrapped


def build_model(out: pathlib.Path, tokenizer: PreTrainedTokenizerFast) -> None:
    """Save seeded random float32 weights of a two-layer Qwen2 with the tokenizer's vocabulary."""
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    endoftext = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,  # vLLM's CPU attention needs at least 32
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        # Larger than the default 0.02 so the greedy choice is clear-cut, not a near tie a
        # different batch shape could flip (a P/D split against the coupled route).
        initializer_range=0.5,
        bos_token_id=endoftext,
        eos_token_id=im_end,
        pad_token_id=endoftext,
        torch_dtype="float32",
    )
    torch.manual_seed(SEED)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=endoftext, eos_token_id=[im_end, endoftext], pad_token_id=endoftext
    )
    model.save_pretrained(out, safe_serialization=True)


def main(argv: list[str]) -> int:
    """Build the model into ``argv[1]``."""
    if len(argv) != 2:
        sys.stderr.write("usage: make_model.py OUT_DIR\n")
        return 2
    out = pathlib.Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    build_model(out, tokenizer)
    names = sorted(path.name for path in out.iterdir())
    sys.stdout.write(json.dumps({"model": str(out), "files": names}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
