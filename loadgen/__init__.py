"""Load generation: the background agent users (locust) and the streaming client that stamps
every response chunk. Filled by the bench issue; nothing here yet."""
