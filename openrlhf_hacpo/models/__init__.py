"""Model math shared by the policy, reference and scoring paths: response log-probs of a causal LM, tokenizers."""
from .logprobs import LOGPROB_PATHS, ResponseLogprobs, fused_head_unsupported, response_logprobs, score_logprobs
from .tokenizer import load_tokenizer, looks_like_local_path

__all__ = ["LOGPROB_PATHS", "ResponseLogprobs", "fused_head_unsupported", "load_tokenizer", "looks_like_local_path",
           "response_logprobs", "score_logprobs"]
