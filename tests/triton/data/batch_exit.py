"""A model file for the hkbatch backend whose TritonBatchModel calls sys.exit: the load fails, the
server (and every other model in it) keeps running."""
import sys


class TritonBatchModel:
    def __init__(self, args):
        sys.exit("this model leaves")
