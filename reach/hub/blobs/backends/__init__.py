"""The blob stores, one module each; a store's client library loads only with its module."""
