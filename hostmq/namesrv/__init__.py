"""The NameServer: a pure route table (``routes``; its records are ``protocol.route_data``) and its process."""
