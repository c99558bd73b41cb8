"""The NameServer: a pure route table (``routes``, records in ``route_data``) and, later, its process."""
