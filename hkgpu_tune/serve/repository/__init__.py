"""The model repository: config.pbtxt and model files, the engines (TensorRT plans, the torch
engine, the hkbatch backend) and the copy of a model's previous version kept for a redeploy."""
