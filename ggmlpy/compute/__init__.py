"""Running graphs: scheduler, graph allocation, async transfers, events, and the thread policy."""
