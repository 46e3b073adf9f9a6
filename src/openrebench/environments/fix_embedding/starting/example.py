"""How to load the models, measure a loss and save your answer (run: python example.py)."""

import numpy as np

from openrebench.lm import evaluate, load_model, save_checkpoint

large = load_model("large_model")  # the permuted model: its token embedding rows are shuffled
small = load_model("small_model")  # a smaller model trained correctly on the same data
val = np.memmap("data/val.bin", dtype=np.uint16, mode="r")
print("large (permuted) val loss", evaluate(large, val, batches=4))
print("small val loss", evaluate(small, val, batches=4))
# ... fix `large` here ...
save_checkpoint("fixed_model", large)  # what the scorer reads: same architecture, any weights
