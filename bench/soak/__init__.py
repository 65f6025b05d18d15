"""The fault soak (issues 12 and 24): ``python -m bench.soak`` (``scripts/soak.sh``).

Per mode (``plain-redis``, ``plain-mysql``, ``exactly-once``, and the control ``no-dedup``: the
same handler behind a plain listener), 4 consumer processes of the same kinds in every mode (8
callback threads each; by default 3 classic push consumers and one 5.x PushConsumer, each kind
on its own topic and group) consume what a producer sends: every business key once and 30 % of
them again (a third within 10 ms, the rest seconds later), while seeded faults hit: SIGKILLed
consumers (restarted), a Redis ``kill -9`` (AOF ``everysec``), a MariaDB ``kill -9``, a graceful
broker restart. Every business effect is a MariaDB row; every decision and every answer a line
in the consumer's evidence file. The report counts keys lost (not applied by a deadline after
the last fault), outstanding (still out when a quick run stopped) and delayed, per consumer kind
and cause and beside the control; nacks; and keys applied more than once, each explained from
the evidence (:mod:`bench.soak.evidence`).

Modules: :mod:`.plan` (the seeded key plan, consumer kinds and fault schedule),
:mod:`.consumer` (a consumer process), :mod:`.evidence` (what the files and rows say),
:mod:`.accounting` (lost, outstanding, delayed, per kind, beside the control), :mod:`.run`
(servers, producers, faults, drain, report), :mod:`.report` (the table and the chart).
"""
