def handler(event, context):
    """A stand-in for the user's handler: the consumer stack only checks how flightlock attaches."""
    return {"ok": True}
