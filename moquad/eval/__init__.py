"""Stage 3: evaluation of a pre-trained checkpoint.

The protocols are one table, :data:`moquad.eval.protocols.PROTOCOLS`: features (multi-clip features
cached in Lance) -> retrieve (exact search in ``search``, the Lance index in ``ann``; hit@k and weighted
kNN), linear (probe), finetune (full fine-tuning from the checkpoint or random init, multi-view test),
cam (activation maps). Each writes JSON + a text table recording protocol, checkpoint sha256 and data
manifest checksum.
"""
