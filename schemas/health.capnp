@0x86b455cd9a82b41a;
# The health interface `capsvc serve` answers beside the application's bootstrap
# (capsvc.health), for clients that only speak Cap'n Proto; the HTTP probes of
# `--http-port` (/healthz, /readyz) tell the same thing to Kubernetes, Consul and the like.
#
# Modeled on gRPC's health checking protocol (grpc.health.v1, health.proto): the same
# statuses in the same order, so a gateway can map one onto the other number for number.
#
# How a client reaches it: bootstrap the server as usual and treat the bootstrap
# capability as a `Health` (pycapnp: `client.bootstrap().cast_as(health.Health)`; C++:
# `client.bootstrap().castAs<Health>()`), then call `check`. The server routes every call
# whose interface ID is Health's to its health service and every other call to the
# application, so the one address serves both.

interface Health {
  check @0 (service :Text) -> (status :ServingStatus);
  # How `service` is doing. The empty name asks about the server as a whole: `serving`
  # while it accepts calls, `notServing` while it starts up or drains before a shutdown.
  # A name the server does not know gives `serviceUnknown` (grpc.health.v1 answers
  # NOT_FOUND there; an enumerant lets a Cap'n Proto client tell it from a failure).
}

enum ServingStatus {
  unknown @0;         # not reported (the default of a struct that never set it)
  serving @1;         # accepting calls
  notServing @2;      # alive, but not accepting calls now (starting, draining, stopped)
  serviceUnknown @3;  # `check` named a service this server does not have
}
