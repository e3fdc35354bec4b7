"""A model file for the hkbatch backend with no TritonBatchModel class: loading it must fail."""
VALUE = 1
