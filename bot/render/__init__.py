"""Block Kit rendering: pure functions of events and state to Slack message JSON.

What a Slack thread shows is a projection of the log (DESIGN, "Slack"). One module per
thing people see:

- :mod:`bot.render.approval`: the approval card, open and decided, with the rule that
  decided who may approve and the votes so far;
- :mod:`bot.render.reconcile`: the card asking whether an interrupted call happened;
- :mod:`bot.render.lines`: one compact line per event people need to see;
- :mod:`bot.render.status`: the thread's status message and its Cancel button;
- :mod:`bot.render.modals`: the reject-reason and reconcile-note modals;
- :mod:`bot.render.edit`: the approval card's Edit modal (a call's arguments as a form),
  and its submission read back;
- :mod:`bot.render.home`: the App Home tab and the ``/opsloop`` answers;
- :mod:`bot.render.audit`: the answer to ``/opsloop audit`` (a thread's approvals);
- :mod:`bot.render.notification`: the plain ``text`` sent alongside, for notifications.

:mod:`bot.render.common` holds what they share: the block builders, the binding of a
button to one pending call, and names of tools and people. Every text that the model, a
tool or a person wrote goes through :func:`bot.mrkdwn.escape`; our own mentions and
dates are the only ``<…>`` tokens. Every renderer keeps within Slack's limits
(:mod:`bot.limits`).

Pure: no I/O here.
"""
