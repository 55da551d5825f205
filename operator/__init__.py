"""infernetes.operator: the InferenceService CRD and the kopf operator that runs it.

Importing this package stays light (no kopf, no kubernetes client): `render` and the CRD
generator are pure functions used by the CLI, the tests and the handlers alike.
"""
