//! Redis Cluster failovers and slot migrations under load.
