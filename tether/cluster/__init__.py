"""Starters for the fleet's services as local processes on loopback: processes and addresses, no logic.

    from tether.cluster.postgres import PostgresServer   # the registry's PostgreSQL
    from tether.cluster.nats import NatsCluster          # the experience stream's NATS JetStream servers
"""
