"""Stage 3: evaluation of a pre-trained checkpoint.

features (multi-clip features cached in Lance) -> retrieve (kNN), linear (probe), finetune
(full fine-tuning, multi-view test), cam (activation maps). Each writes JSON + a text table
recording protocol, checkpoint sha256 and data manifest checksum.
"""
