"""The wire vocabulary: every JSON key and fixed value the transforms read or write.

Transforms spell a wire key only through these names, so a key that vLLM or OpenAI renames is
changed in one place.
"""

from __future__ import annotations

from typing import Final

# Top-level request keys.
MODEL: Final = "model"
MESSAGES: Final = "messages"
PROMPT: Final = "prompt"
INPUT: Final = "input"
REQUEST_ID: Final = "request_id"
TOKEN_IDS: Final = "token_ids"
FEATURES: Final = "features"
SAMPLING_PARAMS: Final = "sampling_params"
OUTPUT_MODE: Final = "output_mode"
PARSE_CONTEXT: Final = "parse_context"
STREAM: Final = "stream"
STREAM_OPTIONS: Final = "stream_options"
INCLUDE_USAGE: Final = "include_usage"
CACHE_SALT: Final = "cache_salt"
PRIORITY: Final = "priority"
RETURN_TOKEN_IDS: Final = "return_token_ids"
KV_TRANSFER_PARAMS: Final = "kv_transfer_params"
EC_TRANSFER_PARAMS: Final = "ec_transfer_params"
EXTRA_ARGS: Final = "extra_args"
TOOLS: Final = "tools"
TOOL_CHOICE: Final = "tool_choice"
PARALLEL_TOOL_CALLS: Final = "parallel_tool_calls"
CHAT_TEMPLATE_KWARGS: Final = "chat_template_kwargs"
INCLUDE_REASONING: Final = "include_reasoning"

# Output caps, wherever each API keeps them.
MAX_TOKENS: Final = "max_tokens"
MAX_COMPLETION_TOKENS: Final = "max_completion_tokens"
MAX_OUTPUT_TOKENS: Final = "max_output_tokens"
MIN_TOKENS: Final = "min_tokens"

# KV connector flags.
DO_REMOTE_DECODE: Final = "do_remote_decode"
DO_REMOTE_PREFILL: Final = "do_remote_prefill"

# Multimodal features.
MM_HASHES: Final = "mm_hashes"
MM_PLACEHOLDERS: Final = "mm_placeholders"
KWARGS_DATA: Final = "kwargs_data"
OFFSET: Final = "offset"
LENGTH: Final = "length"

# Response envelopes.
ID: Final = "id"
OBJECT: Final = "object"
CREATED: Final = "created"
CHOICES: Final = "choices"
INDEX: Final = "index"
MESSAGE: Final = "message"
DELTA: Final = "delta"
TEXT: Final = "text"
ROLE: Final = "role"
CONTENT: Final = "content"
REASONING: Final = "reasoning"
REASONING_CONTENT: Final = "reasoning_content"
TOOL_CALLS: Final = "tool_calls"
FINISH_REASON: Final = "finish_reason"
STOP_REASON: Final = "stop_reason"
LOGPROBS: Final = "logprobs"
TOP_LOGPROBS: Final = "top_logprobs"
USAGE: Final = "usage"
PROMPT_LOGPROBS: Final = "prompt_logprobs"
ERROR: Final = "error"

# Fixed values.
ASSISTANT: Final = "assistant"
CHAT_COMPLETION_OBJECT: Final = "chat.completion"
CHAT_COMPLETION_CHUNK_OBJECT: Final = "chat.completion.chunk"

# Request-leg keys (request side, issue 3).
MM_METADATA: Final = "mm_metadata"
VLLM_XARGS: Final = "vllm_xargs"
RESPONSE_FORMAT: Final = "response_format"
STRUCTURED_OUTPUTS: Final = "structured_outputs"
TYPE: Final = "type"
JSON_SCHEMA: Final = "json_schema"
JSON_OBJECT: Final = "json_object"
STRUCTURAL_TAG: Final = "structural_tag"
SCHEMA: Final = "schema"
JSON_KEY: Final = "json"
FUNCTION: Final = "function"
AUTO: Final = "auto"
LOGPROB_TOKEN_IDS: Final = "logprob_token_ids"
ECHO: Final = "echo"
USE_BEAM_SEARCH: Final = "use_beam_search"
LENGTH_PENALTY: Final = "length_penalty"
