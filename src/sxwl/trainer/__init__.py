"""The trainer the agent runs for a fine-tune (docs/trainer.md): ``python -m sxwl.trainer RUN_JSON``
fine-tunes a causal LM with a LoRA adapter, printing ``protocol.finetune`` progress lines, writing
checkpoints and the adapter under the output dir. Needs the optional extra ``train``; it imports
nothing of sxwl but ``sxwl.protocol``."""


class TrainerError(Exception):
    """A run that cannot start or go on for a reason the user can fix: said in one line on stderr."""
