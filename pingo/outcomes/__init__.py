"""What an action's outcome does to actions, datasets and workflows (`OutcomeService`).

Outcomes arrive by many roads: a cluster's signed callback, the local executor's
reporter, the reaper, a user's kill. `pingo.callbacks` holds only the callback
transport's signatures.
"""
