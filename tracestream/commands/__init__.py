"""The commands over the engine: verify, restore, evidence (inspect, anchors), batch, view."""
