"""Model adapters behind the ``Model`` port."""

from engine.models.base import Decision, Model, ModelError, ToolUse
from engine.models.scripted import ScriptedModel

__all__ = ["Decision", "Model", "ModelError", "ScriptedModel", "ToolUse"]
