from wallfinder.cli import entry_point

if __name__ == "__main__":  # spawned worker processes import this module too
    entry_point()
