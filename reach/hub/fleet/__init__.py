"""The agents the hub knows: registry, reachability from two channels, probes, semantic matching."""
