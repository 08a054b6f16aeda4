"""The agents the hub knows: registry, reachability from two signals, probes, semantic matching."""
