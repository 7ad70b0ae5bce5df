import './base.css';
import './egress.css';
