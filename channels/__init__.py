"""Platform channels: each speaks one chat platform and meets the core only at the bus."""
