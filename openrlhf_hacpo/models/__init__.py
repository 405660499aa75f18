"""Model math shared by the policy, reference and scoring paths: response log-probs of a causal LM."""
from .logprobs import (LOGPROB_PATHS, ResponseLogprobs, fused_head_unsupported, response_logprobs, rows_to_batch,
                       score_rows)

__all__ = ["LOGPROB_PATHS", "ResponseLogprobs", "fused_head_unsupported", "response_logprobs", "rows_to_batch",
           "score_rows"]
