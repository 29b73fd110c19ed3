"""Attention maps of a trained model: every head of every layer, for one sentence.

    python -m experiments.attention_maps --config=configs/numbers.py --workdir=runs/numbers \
        --sentence="three hundred and forty-seven" [--out=experiments/results/attention_maps.png]

Writes the PNG and, beside it, a .md with the command, the model and the machine.

The model translates the sentence (decoding as in the config); then the weights of every
attention call of one teacher-forced pass over (sentence, translation) are recomputed from
the module's recorded inputs and parameters (experiments/attention_weights.py). The figure has
one row per layer and attention kind (encoder self-attention, decoder self-attention,
encoder-decoder attention) and one column per head. Rows of a map are the decoder's (or
encoder's) query positions, columns the key positions; decoder rows are labelled with the
output token that position predicts.
"""

from __future__ import annotations

import os
from typing import Any

from transformer.errors import UserError, fail, flags_parser


def attention_maps(config: Any, workdir: str, sentence: str, out: str) -> dict[str, Any]:
  """Translates `sentence` with the workdir's newest checkpoint and plots its attention."""
  import jax.numpy as jnp

  from experiments.attention_weights import capture_attention, maps, plot, token_labels
  from transformer import infer
  from transformer.nn.model_family import build_model

  model = infer.restore(config, workdir)
  tokenizer, translator, params, label = (model.tokenizer, model.translator, model.params,
                                          model.label)
  src = tokenizer.encode(sentence)
  hyp = translator.translate_ids(params, [src])[0]
  tgt = list(hyp) + [1]
  model = build_model(translator.model_config)
  records = capture_attention(model, params, jnp.asarray([src], jnp.int32),
                              jnp.asarray([tgt], jnp.int32))
  attn = maps(records)
  translation = tokenizer.decode(hyp)
  src_labels = token_labels(tokenizer, src)
  tgt_in = [0] + tgt[:-1]
  title = (f"{workdir} ({label}): \"{sentence}\" -> \"{translation}\"\n"
           "rows: query positions (decoder rows labelled with the token they predict); "
           "columns: key positions")
  plot(attn, src_labels, token_labels(tokenizer, tgt_in), token_labels(tokenizer, tgt),
       title, out)
  result = {"translation": translation, "checkpoint": label, "maps": len(attn), "path": out,
            "heads": int(attn[0]["weights"].shape[0]), "sentence": sentence, "workdir": workdir,
            "source_pieces": src_labels, "output_pieces": token_labels(tokenizer, tgt)}
  from measuring import report

  result["markdown"] = report.write(os.path.splitext(out)[0], command=report.command_line(),
                                    **report_parts(result, config))[0]
  return result


def report_parts(result: dict[str, Any], config: Any) -> dict[str, Any]:
  """`report.write`'s title, intro, body and record of the maps: the model, the sentence, the
  figure."""
  m = config.model
  workdir = result["workdir"]
  note = ""
  if os.path.normpath(workdir) != os.path.normpath(os.path.join("runs", "numbers")):
    note = (f"\nThe model is not `runs/numbers` (the README's main command) but `{workdir}`; "
            "see the results README for how it was trained.\n")
  intro = (
    f"Every head of every layer of `{workdir}` ({result['checkpoint']}; d_model {m.d_model}, "
    f"{m.num_layers} + {m.num_layers} layers, {m.num_heads} heads) for one sentence, made by "
    "`experiments/attention_maps.py` (method in its docstring): the weights are recomputed "
    "from each attention module's recorded inputs and parameters.\n" + note + "\n"
    f"- Source: \"{result['sentence']}\" -> pieces {' '.join(result['source_pieces'])}\n"
    f"- Model's translation: \"{result['translation']}\" -> pieces "
    f"{' '.join(result['output_pieces'])}\n")
  return {"title": "Attention maps", "intro": intro,
          "body": [f"![attention maps]({os.path.basename(result['path'])})\n"],
          "record": {k: v for k, v in result.items() if k != "markdown"}}


if __name__ == "__main__":
  from absl import app, flags
  from ml_collections import config_flags

  _CONFIG = config_flags.DEFINE_config_file("config", None, "Config of the trained model.")
  _WORKDIR = flags.DEFINE_string("workdir", None, "Workdir: checkpoint and vocabulary.")
  _SENTENCE = flags.DEFINE_string("sentence", "three hundred and forty-seven", "Source sentence.")
  _OUT = flags.DEFINE_string("out", os.path.join("experiments", "results", "attention_maps.png"),
                             "PNG path.")

  def main(argv: list[str]) -> None:
    if len(argv) > 1:
      fail(f"unexpected arguments {' '.join(argv[1:])!r}")
    if _CONFIG.value is None or _WORKDIR.value is None:
      fail("--config and --workdir are required, e.g. --config=configs/numbers.py "
           "--workdir=runs/numbers")
    try:
      result = attention_maps(_CONFIG.value, _WORKDIR.value, _SENTENCE.value, _OUT.value)
    except (UserError, ValueError) as e:
      fail(str(e))
    print(f"translation: {result['translation']}\n{result['maps']} attention layers x "
          f"{result['heads']} heads ({result['checkpoint']}) -> {result['path']}, "
          f"{result['markdown']}", flush=True)

  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  app.run(main, flags_parser=flags_parser())
