"""swapcast model supply chain: registry, fetch, importers, reference networks.

Nothing in this package imports `app`: dependencies flow from serving to the supply chain only.
"""
