"""Speculative decoding's seam: a proposer guesses the tokens that follow a request, the
scheduler schedules them with its next step, and the model runner verifies them against its own
samples (``verify.py``). N-gram prompt lookup (``ngram.py``) is the proposer built; draft-model
and EAGLE proposers plug in behind the same interface."""
