"""The fault soak (issue 12): ``python -m bench.soak`` (``scripts/soak.sh``).

Per mode, 4 consumer processes (8 callback threads each, the classic client; in plain-redis one
of them is a 5.x PushConsumer) consume a topic fed by a producer that sends every business key
once and 30 % of them again (a third within 10 ms, the rest seconds later), while seeded faults
hit: SIGKILLed consumers (restarted), a Redis ``kill -9`` (AOF ``everysec``), a MariaDB ``kill
-9``, a graceful broker restart. Every business effect is a MariaDB row; every decision a line
in the consumer's evidence file. The report counts lost and doubly applied keys and explains
each double apply from the evidence (:mod:`bench.soak.evidence`).

Modules: :mod:`.plan` (the seeded key plan and fault schedule), :mod:`.consumer` (a consumer
process), :mod:`.evidence` (what the files and rows say), :mod:`.run` (servers, producer,
faults, drain, report).
"""
