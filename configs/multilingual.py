"""One model, two directions: English to German and English to French numbers (Johnson et al.
2017, "Google's Multilingual Neural Machine Translation System"), `configs/multilingual.py[:tiny]`.

    python -m transformer.main --config=configs/multilingual.py --workdir=runs/multilingual
    echo "three hundred and twelve" | python -m transformer.main --mode=translate \
        --workdir=runs/multilingual --config.decode.tag='>>fr<<'

The main corpus is the embedded numbers corpus in English and German, its sources after the
tag `>>de<<`; a second corpus, `fr`, is the same corpus's English and French, after `>>fr<<`
(transformer/data/mixture.py). The tag chooses the target language: at translation time from
`decode.tag`, or from an input line that starts with it (`>>fr<< twelve`). Validation and test
are reported per direction: `eval/*` and `test/*` for German, `eval_fr/*` and `test_fr/*` for
French. The model and the recipe are configs/numbers.py's (`:tiny` for tests), with target rows
long enough for French, whose numbers are written as separate words.
"""

from ml_collections import config_dict

from configs import common, numbers


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
  config = numbers.get_config(arg)
  config.name = "multilingual-numbers" + ("-tiny" if arg == "tiny" else "")
  config.data.tag = ">>de<<"
  config.data.corpora.fr = common.corpus("numbers", target_lang="fr", tag=">>fr<<")
  config.data.packed_target_len = 64
  if arg != "tiny":
    config.data.vocab_size = config.model.vocab_size = 384
  evals = config.evals
  evals.valid_translation_fr = {**evals.valid_translation.to_dict(), "corpus": "fr",
                                "prefix": "eval_fr"}
  evals.test_translation_fr = {**evals.test_translation.to_dict(), "corpus": "fr",
                               "prefix": "test_fr"}
  return config
