"""Placement scorers, one a module (``policies.placement.plugins.Scorer``); ``registry`` names them."""
