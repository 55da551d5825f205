"""infernetes.runtime"""
