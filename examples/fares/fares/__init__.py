"""Taxi-fare regression on CSV files: a second example of a model trained through the runtime's
Task interface (fares.task), with its data generator (fares.generate)."""
