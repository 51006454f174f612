"""The MultiHeadAttention layer and its KV cache."""
