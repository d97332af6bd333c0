"""A local Slack workspace, in the browser: what ``opsloop local`` runs the bot against.

The unchanged Bolt app talks to this Slack as to the real one, and only over the wire:
the Web API it calls (``SLACK_API_URL``) is served here with Slack's answers, and what
people do in the page becomes the signed requests Slack would send to its request URL
(``POST /slack/events``). Nothing here imports ``bot``: ``bot/local_mode.py`` puts the
two on one port, so local mode runs the production code paths, only Slack is replaced.

    identity        who the workspace, the app and the people are
    slack_requests  what Slack sends to an app: envelopes, payloads, signatures (pure)
    workspace       the workspace's state: channels, messages, modals (no I/O)
    state_file      the workspace kept in a JSON file, replaced atomically
    web_api         the Slack Web API methods the bot uses, over a workspace
    agent_api       its agent surfaces: loading status, streams, agent sessions
    streams         a streamed message: its chunks checked, its state, its blocks (pure)
    api_checks      the Web API's refusals and the checks its methods share (pure)
    app_link        what people do, sent to the app as Slack sends it (signed HTTP)
    page_input      what people type and click, checked as Slack's client does (pure)
    live            live updates for the page (server-sent events)
    ui              the page's JSON API
    demo            local mode's own opsloop.yaml and the platform API its action calls
    github          a fake GitHub REST API (Actions runs, jobs, logs, issues) and its webhooks
    pagerduty       a fake PagerDuty REST API (on-calls, users, incidents, notes)
    integrations    both on the page's port for local mode's opsloop.yaml, and the alert
                    the page fires (a signed POST /alerts/generic)
    loopback        how those fakes listen on a port of their own (the tests' way)
    server          the assembly: the workspace, its credentials, its routes, its link
    static/         the page: vanilla HTML, CSS and JavaScript, no build step

The test suite's fake Slack (``tests/fakes/slack.py``) is the same Web API and the same
payload builders, with controls for tests on top; its fake GitHub and PagerDuty are these.
"""
