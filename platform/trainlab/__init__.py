"""trainlab: choose how to train a language model by running it (see README.md)."""

from trainlab.vocab import quiet as _quiet

_quiet.install()  # other libraries' lines that say nothing to a trainlab user (vocab.quiet)
