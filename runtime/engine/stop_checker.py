"""When a request is done: its length, EOS, a stop token, or a stop string (the detokenizer's)."""

from __future__ import annotations

from infernetes.runtime.engine.request import Request, RequestStatus

StopResult = tuple[RequestStatus | None, int | str | None]  # (finished status, stop_reason)


def check_stop_token(request: Request, token_id: int, max_model_len: int) -> StopResult:
    """Length, EOS and stop tokens, after ``token_id`` was appended."""
    params = request.sampling_params
    assert params is not None and params.max_tokens is not None  # settled by the input processor
    if request.num_output_tokens >= params.max_tokens or request.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH, None
    if request.num_output_tokens < params.min_tokens:
        return None, None
    if not params.ignore_eos and token_id == request.eos_token_id:
        return RequestStatus.FINISHED_STOPPED, None
    if token_id in params.all_stop_token_ids:
        reason = token_id if token_id in (params.stop_token_ids or ()) else None
        return RequestStatus.FINISHED_STOPPED, reason
    return None, None


def check_stop(request: Request, token_id: int, max_model_len: int) -> StopResult:
    """Detokenize ``token_id`` (unless it is a stop token kept out of the text) and check every
    stop condition; a stop string found in the new text ends the request."""
    params = request.sampling_params
    assert params is not None
    status, reason = check_stop_token(request, token_id, max_model_len)
    if request.detokenizer is None:
        return status, reason
    hidden_stop = status == RequestStatus.FINISHED_STOPPED and not params.include_stop_str_in_output
    if not hidden_stop:
        new_text = request.detokenizer.add_token(token_id)
        if request.num_output_tokens > params.min_tokens:
            stop = request.detokenizer.find_stop(len(new_text))
            if stop is not None:
                return RequestStatus.FINISHED_STOPPED, stop
    return status, reason
