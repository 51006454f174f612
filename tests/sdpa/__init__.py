"""SDPA: the semantics rule by rule, properties against the reference, errors, the
reference itself and the kernels' exp2."""
