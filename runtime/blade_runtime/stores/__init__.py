"""The stores ring: ``MemoryStore`` (in the process), ``SQLiteStore`` (the embedded durable
default), ``PostgresStore`` (shared by workers on many machines) and ``open_store(url)``.

Each driver is imported only when it is used: importing a generated package opens none.
"""
