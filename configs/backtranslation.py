"""Real pairs plus back-translated ones: `configs/backtranslation.py[:SRC-TGT][,small]`.

Back-translation (Sennrich et al. 2016; Edunov et al. 2018): a reverse model translates
monolingual target-side text into synthetic sources, and the forward model trains on the real
pairs (the main corpus, configs/text.py's fields) and the synthetic ones (the corpus
`synthetic`) together (transformer/data/mixture.py):

    python -m transformer.main --config=configs/backtranslation.py:en-de \
        --config.data.train_files.en=real.en --config.data.train_files.de=real.de \
        --config.data.corpora.synthetic.train_files.en=synthetic.en \
        --config.data.corpora.synthetic.train_files.de=mono.de \
        --config.data.corpora.synthetic.tag='<BT>'

`data.corpora.synthetic.tag` ('' by default) puts a token in front of every synthetic source
(tagged back-translation, Caswell et al. 2019), so the model can tell them from real ones;
`data.weight` upsamples the real pairs (e.g. 2: each real pair twice per epoch). The synthetic
corpus has no validation or test split of its own (`heldout_pairs=0`): validation and test are
the real corpus's. The whole pipeline is in the README and docs/data.md;
experiments/backtranslation.py runs it on the numbers corpus.
"""

from ml_collections import config_dict

from configs import common, text


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
  config = text.get_config(arg)
  src, tgt = config.data.source_lang, config.data.target_lang
  config.name = f"backtranslation-{src}-{tgt}"
  files = config_dict.ConfigDict({src: config_dict.placeholder(str),
                                  tgt: config_dict.placeholder(str)})
  config.data.corpora.synthetic = common.corpus("text", train_files=files, heldout_pairs=0)
  return config
