"""Speculative decoding's seam: a proposer guesses the tokens that follow a request, the
scheduler schedules them with its next step, and the model runner verifies them against its own
samples (``verify.py``). N-gram prompt lookup (``ngram.py``) and a draft model or EAGLE-1/EAGLE-3
head or DeepSeek MTP layer (``draft_model.py``) are the proposers built."""
