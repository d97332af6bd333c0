"""Model adapters behind the ``Model`` port."""

from engine.models.base import Decision, Model, ModelError, TextSink, ToolUse
from engine.models.scripted import ScriptedModel

__all__ = ["Decision", "Model", "ModelError", "ScriptedModel", "TextSink", "ToolUse"]
