"""`make faults`: fault injection into real bench processes; every row is also a test."""
