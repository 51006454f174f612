"""The attention family: attention(), additive_attention, masked_softmax, nadaraya_watson."""
