"""infernetes.operator"""
