"""The Ray executor: the driver, stage dispatch, monitors, the session, traffic and metrics."""
