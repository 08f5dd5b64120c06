"""The one exception an oracle raises."""


class Wrong(Exception):
    """ggmlpy accepted a case and computed something else than numpy (or than the documented result)."""
